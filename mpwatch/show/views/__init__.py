"""Views of a run that the reports and the tab both show."""
