"""``python -m app.ruledocs [DIR]``: write the rule reference (default docs/rules/)."""

import sys
from pathlib import Path

from app.core.ruleset import default_ruleset
from app.ruledocs import write_pages

directory = Path(sys.argv[1] if len(sys.argv) > 1 else
                 Path(__file__).resolve().parent.parent.parent / "docs" / "rules")
changed = write_pages(default_ruleset(), directory)
print(f"{directory}: {len(changed)} page(s) written" + (f" ({', '.join(changed)})" if changed else ""))
