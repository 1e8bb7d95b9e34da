from rollout_fleet.cli import main

main()
