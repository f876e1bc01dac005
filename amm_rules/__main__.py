"""``python -m amm_rules``: the same command line as ``amm-rules``."""

from amm_rules.cli import main

if __name__ == "__main__":
    main()
