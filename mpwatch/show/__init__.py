"""Show: findings and tables for people: text, Markdown, JSON, HTML, and ``mpwatch diagnose``.

Reads only :class:`mpwatch.read.Run` and :class:`mpwatch.judge.Finding`.
"""
