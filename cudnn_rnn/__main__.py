"""``python -m cudnn_rnn ...``: the ``cudnn-rnn`` command line (cudnn_rnn/cli.py)."""
import sys

from .cli import main

if __name__ == "__main__":  # importing the module (documentation tools do) runs nothing
    sys.exit(main())
