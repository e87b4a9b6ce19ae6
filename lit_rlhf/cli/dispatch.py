"""``lit-rlhf VERB ...``, the console script: ``export`` goes to :mod:`lit_rlhf.cli.export`,
``plan`` to :mod:`lit_rlhf.cli.plan`, every other verb (``fit``, ``validate``, ``test``,
``predict``) and ``--help`` to the LightningCLI of :mod:`lit_rlhf.cli.app`.

The dispatcher is the top of the package: it imports the verbs, and no verb imports it
(pyproject.toml's import contract "cli: the dispatcher over its verbs" checks it).
"""

from __future__ import annotations

import sys

from lit_rlhf.cli.quiet import quiet_third_party


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: ``lit-rlhf`` (``args``: the command line after it, default
    ``sys.argv[1:]``). ``export`` goes to :func:`lit_rlhf.cli.export.export_main`; for the
    others, when the run is over the module releases its engine (``close``: a vLLM instance),
    then every rank of a multi-process run meets at a barrier and destroys the process group
    (see ``shutdown_distributed``). An error of a known kind ends it with one line
    (:func:`~lit_rlhf.cli.errors.one_line_errors`)."""
    argv = sys.argv[1:] if args is None else args
    quiet_third_party()  # before the imports that print (lit_rlhf.cli.quiet says what and why)
    from lit_rlhf.cli.errors import one_line_errors  # each verb's imports only when it runs

    with one_line_errors():
        if argv[:1] == ["export"]:
            from lit_rlhf.cli.export import export_main

            export_main(argv[1:])
            return
        if argv[:1] == ["plan"]:
            from lit_rlhf.cli.plan import plan_main

            plan_main(argv[1:])
            return
        from lit_rlhf.cli.app import cli_main

        cli = cli_main(args)
    close = getattr(cli.model, "close", None)
    if callable(close):
        close()
    from lit_rlhf.strategies.shutdown import shutdown_distributed

    shutdown_distributed()
