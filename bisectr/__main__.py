from .present.cli import program

program()
