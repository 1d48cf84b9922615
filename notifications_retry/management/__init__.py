"""The management commands, thin: :mod:`.commands` parse options and call the engine, the relay,
housekeeping or recovery; :mod:`.option_types` checks the options' values, :mod:`.progress` draws a
progress line."""
