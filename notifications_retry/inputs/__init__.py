"""What callers and operators hand the app, checked before anything reaches the database.

:mod:`.validation` checks the public API's text and payload, :mod:`.arguments` its other arguments by
type; :mod:`.addresses` is a recipient as the suppression list stores it; :mod:`.url_policy` is where a
webhook may post (the SSRF guard).
"""
