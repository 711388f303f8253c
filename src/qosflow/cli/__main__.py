"""``python -m qosflow.cli``: the ``qosflow`` command."""

import sys

from qosflow.cli import main

sys.exit(main())
