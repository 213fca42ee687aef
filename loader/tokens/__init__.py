"""The token loader: Arrow token rows, packed documents, their outputs and streaming reads."""
