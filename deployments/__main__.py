from deployments.definitions import main

main()
