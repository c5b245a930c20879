"""``python -m drafttree ...`` (and ``accelerate launch -m drafttree train ...``): the command line."""

import sys

from drafttree.cli import main

sys.exit(main())
