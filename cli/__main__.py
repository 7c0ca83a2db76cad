"""``python -m fastspec_cli``."""
from .main import main

main()
