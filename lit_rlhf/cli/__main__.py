"""``python -m lit_rlhf.cli VERB ...``: the same as the ``lit-rlhf`` console script."""

from lit_rlhf.cli.dispatch import main

if __name__ == "__main__":
    main()
