"""``python -m pygrad``: the demo (see pygrad/demo.py)."""
import sys

from .demo import main

sys.exit(main())
