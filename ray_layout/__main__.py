from ray_layout.commands.main import main

raise SystemExit(main())
