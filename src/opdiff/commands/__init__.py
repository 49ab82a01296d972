"""One module per `opdiff` subcommand: `add_parser(subparsers)` registers it, setting `run`."""
