from podium.deployments.definitions import main

main()
