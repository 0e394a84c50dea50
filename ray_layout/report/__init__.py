"""The tune's report: a typed summary of what was predicted and measured, rendered as one
document to Markdown, self-contained HTML and a terminal summary, with its plots."""
