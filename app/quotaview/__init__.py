"""``envelope quotas``: a picture of the KAI quota trees.

``model`` builds the tree (node pools, their departments and projects, KAI Queue trees)
from objects with the quota rules' own arithmetic (:mod:`app.crds.kai` decimals, the
:mod:`app.rules.quotas` slots, sums and pool capacity), attaches the rules' findings
and, for a change under review, the numbers before it. ``text`` draws it for a
terminal, ``html`` as one self-contained page, ``model.as_json`` for scripts
(``docs/schemas/quotas-v1.json``); ``browser`` drives a headless Chromium for
``--screenshot``.
"""
