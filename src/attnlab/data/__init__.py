"""The data layer: tokenizers, memory-mapped LM corpora, generated tasks, file readers, batching.

Everything reads local files only and is deterministic given its seeds (no global RNG).
"""

from attnlab.data.batching import (
    ClassificationBatch,
    LMBatch,
    Seq2SeqBatch,
    collate_labelled,
    collate_pairs,
    encode_labelled,
    encode_pairs,
    pad_sequences,
)
from attnlab.data.bpe import BPETokenizer
from attnlab.data.buckets import BucketBatchSampler, split_items
from attnlab.data.corpus import Corpus, load_corpus, prepare_corpus, token_dtype
from attnlab.data.dates import DATE_FORMATS, DateTask, render_date
from attnlab.data.files import read_labelled, read_pairs, read_parallel
from attnlab.data.labels import LabelSet
from attnlab.data.pretrained_tokenizer import PretrainedTokenizer
from attnlab.data.tasks import (
    CLASSIFICATION_TASKS,
    TASKS,
    AdditionTask,
    BalancedParensTask,
    CopyTask,
    MajorityTask,
    ReverseTask,
    SortTask,
    make_task,
)
from attnlab.data.textfiles import list_text_files, read_text
from attnlab.data.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    train_tokenizer,
)
from attnlab.data.windows import LMWindows

__all__ = [
    "PretrainedTokenizer",
    "AdditionTask",
    "BPETokenizer",
    "BalancedParensTask",
    "BucketBatchSampler",
    "ByteTokenizer",
    "CLASSIFICATION_TASKS",
    "CharTokenizer",
    "ClassificationBatch",
    "CopyTask",
    "Corpus",
    "DATE_FORMATS",
    "DateTask",
    "LMBatch",
    "LMWindows",
    "LabelSet",
    "MajorityTask",
    "ReverseTask",
    "Seq2SeqBatch",
    "SortTask",
    "TASKS",
    "Tokenizer",
    "collate_labelled",
    "collate_pairs",
    "encode_labelled",
    "encode_pairs",
    "list_text_files",
    "load_corpus",
    "load_tokenizer",
    "make_task",
    "pad_sequences",
    "prepare_corpus",
    "read_labelled",
    "read_pairs",
    "read_parallel",
    "read_text",
    "render_date",
    "split_items",
    "token_dtype",
    "train_tokenizer",
]
