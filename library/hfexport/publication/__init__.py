"""Publishing a job's output to the Hub (`publish`: one pull request or commit, updated in place) and finding
exports already made for the same inputs (`cache`: locally and in published PRs).
"""
