"""`python -m opdiff ...` (and `torchrun -m opdiff run -- train.py`): the `opdiff` command."""
from opdiff.cli import main
raise SystemExit(main())
