"""Which permanent SMTP replies name the recipient's mailbox as gone (and so suppress it): 5.1.1, 5.1.10,
5.2.1 to RCPT TO or the data; never a 4xx, never another 5xx, never a reply to MAIL FROM."""

from __future__ import annotations

import pytest

from notifications_retry.exceptions import PermanentProviderError, RetryableProviderError
from notifications_retry.providers.email_errors import smtp_reply_error


@pytest.mark.parametrize(
    ("code", "text", "where", "kind"),
    [
        (550, "5.1.1 No such user here", "RCPT TO", "mailbox_unavailable"),
        (556, "5.1.10 Recipient address has null MX", "RCPT TO", "mailbox_unavailable"),
        (550, "5.2.1 Mailbox disabled, not accepting messages", "RCPT TO", "mailbox_unavailable"),
        (550, "5.1.1 Unknown recipient", "DATA", "mailbox_unavailable"),
        (550, "5.1.1 sender unknown", "MAIL FROM", "smtp_5xx"),
        (552, "5.2.2 Mailbox full", "RCPT TO", "smtp_5xx"),
        (553, "5.1.3 Mailbox name not allowed", "RCPT TO", "smtp_5xx"),
        (554, "5.7.1 Message rejected as spam", "DATA", "smtp_5xx"),
        (550, "No such user here", "RCPT TO", "smtp_5xx"),  # no enhanced status: it does not say
        (550, "5.1.100 something else", "RCPT TO", "smtp_5xx"),
    ],
)
def test_permanent_replies(code, text, where, kind):
    error = smtp_reply_error(code, text, where)
    assert isinstance(error, PermanentProviderError)
    assert error.kind == kind


@pytest.mark.parametrize("text", ["4.1.1 try later", "4.2.1 mailbox busy", "4.3.0 Local error in processing"])
def test_a_451_never_names_the_mailbox_as_gone(text):
    error = smtp_reply_error(451, text, "RCPT TO")
    assert isinstance(error, RetryableProviderError) and error.kind == "smtp_4xx"
