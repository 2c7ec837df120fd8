"""cockpit's front ends: the command line (cli), headless output and the Textual app."""
