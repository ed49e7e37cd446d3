"""Reading and explaining a study: profiles, verdicts, the recommendation, readers, reports."""
