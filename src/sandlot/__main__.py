from sandlot.cli.main import main

main()
