"""``python -m lit_rlhf.measure``: see :mod:`lit_rlhf.measure.update`."""

from lit_rlhf.measure.update import main

raise SystemExit(main())
