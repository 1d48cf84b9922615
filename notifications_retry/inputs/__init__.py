"""What callers and operators hand the app, checked before anything reaches the database.

:mod:`.validation` checks the public API's text and payload and gives a recipient as the suppression
list stores it; :mod:`.arguments` checks the API's other arguments by type; :mod:`.url_policy` is where
a webhook may post (the SSRF guard).
"""
