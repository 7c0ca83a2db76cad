"""``python -m fastspec_cli``."""
from . import main

main()
