from fuelpipe.launch import main

main()
