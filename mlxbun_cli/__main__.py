from mlxbun_cli.app import main

main()
