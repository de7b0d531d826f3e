from fuelpipe.cli import main

main()
