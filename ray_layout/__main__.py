from ray_layout.commands.cli import main

raise SystemExit(main())
