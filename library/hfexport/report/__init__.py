"""Reports: what a job did (`model`), rendered as Markdown for PRs and summaries (`markdown`) and as the model
card's hfexport section (`card`).
"""
