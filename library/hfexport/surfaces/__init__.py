"""The surfaces people use, each a thin layer over the job API: `cli` (the `hfexport` command), `ci` and
`annotations` (the GitHub Action), `webhook` (Hub webhooks), `space` and `worker` (the Gradio Space), `failure`
(one readable category and line for any error).
"""
