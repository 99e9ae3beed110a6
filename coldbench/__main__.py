from coldbench.cli import main

main()
