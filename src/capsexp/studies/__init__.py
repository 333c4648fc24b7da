"""What a study's page shows beyond the comparison's tables, as functions its experiment config names
(``page.sections`` in ``conf/experiment/<name>.yaml``): each takes the runs (labelled by
configuration), the page and its folder, and returns Markdown (and may write a figure there)."""
