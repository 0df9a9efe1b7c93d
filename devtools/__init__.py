"""Tools for working on ksquad, run from the checkout (`make lint`); not in the wheel."""
