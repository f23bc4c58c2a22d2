"""Floor 3 of the house (docs: ARCHITECTURE.md): files that must survive a crash.

``attnlab.checkpoint.atomic`` is the one atomic writer every layer above uses (training
checkpoints, reports, figures, and the Hugging Face and safetensors exports of ``interop``).
"""
