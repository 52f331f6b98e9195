"""``python -m trl_entropy.report RUN_DIR ...``: the same as ``trl-entropy report RUN_DIR ...``."""

import sys

from .command import main


sys.exit(main())
