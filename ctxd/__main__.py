"""``python -m ctxd`` is the ``ctxd`` daemon."""

import sys

from ctxd.daemon import main

sys.exit(main())
