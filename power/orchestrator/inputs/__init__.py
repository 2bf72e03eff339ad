"""The pipeline's first floor: the TOML files in (`schema` -> `loading`, with `locator` and `units`) and the rules
across one file's fields (`rules`); `pin` writes pulled artifacts' digests back into a manifest; `launch_lines/`
reads a launch line in, in the words every engine's reader shares."""
