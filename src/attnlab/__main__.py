"""``python -m attnlab`` (also what ``torchrun -m attnlab`` runs)."""

import sys

from attnlab.cli import main

sys.exit(main())
