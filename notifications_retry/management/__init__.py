"""The management commands, thin: :mod:`.commands` parse options and call the engine, the relay or
housekeeping; :mod:`.option_types` checks the options' values."""
