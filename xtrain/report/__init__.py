"""``xtrain report``: a run (or several, or a chain's stages) as one self-contained HTML page, read
from the files the runs wrote: runs.py (a run folder read; a chain's order), html.py (escaped
pieces), svg.py (a curves panel as inline SVG), sections.py (lineage, plan, data check,
evaluation), samples.py (the sample answers), page.py (the page and where it is written)."""
