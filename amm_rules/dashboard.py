"""``amm_rules.dashboard``: the scheduler preload :mod:`amm_rules.preload` under the name
earlier releases documented, which existing configurations name::

    dask scheduler --preload amm_rules.dashboard

Importing it imports :mod:`amm_rules.preload` (which adds the page to the dashboard), and
its ``dask_setup`` is the preload's: the two names are one preload.
"""

from __future__ import annotations

from amm_rules.preload import dask_setup

__all__ = ["dask_setup"]
