"""Names that become folders (profiles, models, recipes): one path segment each, so a name can neither
escape the results folder nor hide its cells from the globs that find them."""

SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+=~-]*$"
SAFE_NAME_HELP = "letters, digits and . _ + = ~ -, starting with a letter or digit (it names a folder)"
