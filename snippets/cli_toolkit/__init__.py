"""训推工程师 CLI 工具栈 (cli-toolkit) snippets."""
