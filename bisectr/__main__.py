from .present.entry import program

program()
