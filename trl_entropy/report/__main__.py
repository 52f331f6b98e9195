"""``python -m trl_entropy.report RUN_DIR ...``: the same as ``trl-entropy report RUN_DIR ...``."""

import sys

from trl_entropy.scripts.report import main


sys.exit(main())
