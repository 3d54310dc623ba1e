"""One module per schema revision; a released revision is never edited (add the next)."""
