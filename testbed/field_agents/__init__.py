"""Agents built with other frameworks, as their users write them. Each runs with its framework's own virtualenv
(testbed/pyenvs.py), never ksquad's: these modules import nothing of ksquad's, and nothing of ksquad imports them."""
