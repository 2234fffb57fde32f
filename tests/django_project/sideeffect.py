"""Not an installed app: a job naming it must never make the worker import it
(tests/integrations/test_django.py)."""

import os
from pathlib import Path

Path(os.environ["ECHOMQ_DJANGO_DB"] + ".imported").write_text("imported")
