"""One module per `power` sub-command; each is loaded only when invoked (see `power.app.cli`)."""
