"""``python -m broker ...`` runs the ``regionbus`` command line."""

from broker.cli import main

main()
