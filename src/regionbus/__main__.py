"""``python -m regionbus ...`` runs the ``regionbus`` command line."""

from regionbus.broker.cli import main

main()
