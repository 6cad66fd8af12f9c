"""Each way in, tried as an attacker would: the request or the answer, and what must happen."""
