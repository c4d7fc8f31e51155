"""TensorBoard's "Mixed Precision" tab for mpwatch.

Registered through the ``tensorboard_plugins`` entry point of the mpwatch distribution
(``mpwatch = "tensorboard_plugin_mpwatch.loader:MpwatchLoader"``). Importing this package is cheap:
the plugin, pandas and the advisor are imported only when TensorBoard loads the tab.
"""
